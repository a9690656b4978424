"""The Goodhart benchmark: does loopguard keep the *gold* reward up while a proxy reward is being gamed?

Real TRL GRPO training of tiny offline policies on the CPU, nine scenarios (diversity collapse, length
hacking, sentinel hacking, a single-token bonus and a sign-off phrase, the staged flaws also from step 0, and
a clean control), nine arms (a fixed-beta sweep, an adaptive KL controller and
three loopguard modes), several seeds. ``python -m benchmarks.goodhart --quick`` runs it with 2 seeds; see
docs/benchmarks.md for the design, the metrics and the latest results.
"""
