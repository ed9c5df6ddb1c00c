"""The forward pass and what it runs on: weights (plain or resident), linear dispatch, paged KV, sessions,
sampling, the synthetic checkpoint, diagnostics. Exports: load_model, Model, Session, step_batch, sampling."""

from engine.model.forward import Model
from engine.model.loader import load_model
from engine.model.sampling import Sampler, SamplingParams, greedy
from engine.model.session import BatchSession, Session, step_batch
from engine.model.synthetic import synthetic_model

__all__ = ["BatchSession", "Model", "Sampler", "SamplingParams", "Session", "greedy", "load_model", "step_batch",
           "synthetic_model"]
