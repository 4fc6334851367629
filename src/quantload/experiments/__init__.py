"""The load experiments: one module or folder each (a folder when it brings its own part of the
report: prefix_cache, open_loop, sessions, trace, mixed, batching, slots, speculation, context,
noisy_neighbour, kv_types, soak, ramp_up),
listed once in `registry`.

  base          what an experiment declares, is given (ExperimentContext) and returns (ExperimentRun)
  registry      the list, and the lookups every part uses
  running       what every experiment does alike (its invocation id, its workload, running a plan)
  sweep, open_loop, prefix_cache, sessions, trace, mixed, limit_users, limit_rate, kv_types,
  batching, slots, speculation, context, noisy_neighbour
                the experiments
  limit_trials  the limit search's trials, shared by limit_users and limit_rate (and the tune)
  at_limit      the users a flag experiment compares at: the run's found limit, or its own search
  variant_file  variants.jsonl: each server variant the flag experiments and the tune ran (whether
                a variant speculates: speculation.probe, which the tune reads too)
"""
