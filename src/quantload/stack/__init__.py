"""Native orchestration: the stack's services as plain processes on this machine.

  run_driver      the run's folder, context, state, servers and experiments, and the one rule for a
                  failure: what `quantload run`, `tune` and `load` build their run with
  native          `quantload run`: every step in order (NativeRun)
  run_steps       the steps bound to the run's settings, the seam tests put fakes in (RunSteps)
  run_state       run.json's writer
  server_variants a started server restarted with other flags
"""
