"""The benchmarks' shared harness (benchmarks only; what tests share too, /proc readings
and CPU accounting per process among it, is in sluicegate.testing): stopping
process trees and waiting for ports (`processes`), stacks of real processes: `sluicegate
up`, mock providers, an ExtProcServer in its own process (`stack`, `ext_proc_child`),
hand-written Envoy bootstraps (`bootstraps`), statistics (`stats`), and a benchmark's
command line and its section of benchmarks/RESULTS.md (`cli`, `results`). Linux only.
"""
