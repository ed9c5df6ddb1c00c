"""The kernel itself: the call ABI (abi), the Kernel that adjudicates and dispatches, policies and what they
read (policy, shellnorm, needles, ratelimit), the hash-chained journal, traces and notes. Imports nothing of fak/.
"""
