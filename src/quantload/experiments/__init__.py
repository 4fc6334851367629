"""The load experiments: one module each, listed once in `registry`.

  base          what an experiment declares, is given (ExperimentContext) and returns (ExperimentRun)
  registry      the list, and the lookups every part uses
  running       what every experiment does alike (its invocation id, its workload, running a plan)
  sweep, open_loop, prefix_cache, sessions, trace, mixed, limit_users, limit_rate, kv_types
                the experiments
  limit_trials  the limit search's trials, shared by limit_users and limit_rate
"""
