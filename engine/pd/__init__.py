"""Prefill/decode disaggregation over engine/wire: PrefillWorker and DecodeWorker (engine/pd/workers.py), their
nodes behind a link, PDCluster (in-process) and PDHead (over processes), both ServingEngines; PDCollector
(fak_pd_* metrics). Import the modules themselves: they pull in the scheduler.
"""
