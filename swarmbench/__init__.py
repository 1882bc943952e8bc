"""The benchmark suite: procedurally generated failing runs and the baselines a user would run
instead (plain training, the healthy config as oracle, Ray Tune PBT / PB2 / ASHA + random search),
side by side with the swarm under one worker-CPU budget accounting.

    swarm bench benchmarks/suites/dev --methods plain oracle pbt asha swarm --seeds 0 --parallel 1

Modules: `scenarios` (the seeded generator and the suite files), `calibrate` (healthy run → target
and budget, cached by content hash), `accounting` (worker-CPU of trainer processes), `methods`
(one run of one method), `tune_methods` (the Ray Tune trainable and schedulers), `runner` (ledger,
progress, parallel runs), `report` (metrics, tables, plots). See docs/benchmarks.md.
"""
