"""The named steps of the protocol, each a function with typed inputs and a typed result.

A step that cannot produce its result raises a QuantloadError (its typed failure: ModelError,
ServerError, MeasurementError, ...). `quantload run` (quantload.stack.native) calls them in
sequence through `RunSteps`; each subcommand calls the one it names, so a step has one
implementation and each run-directory file one writer.

  prepare  F16/Q8_0/Q4_K_M files of one model, their manifest    -> PreparedModels
  quality  perplexity of one file on WikiText-2 (quality.json)    -> QualityResult
  speed    the machine's roofline probe; llama-bench of one file (speed.json) -> SpeedEntry
  serve    a llama-server of one file; its KV cache checked (kv.json) -> LlamaServer, KvCheck
  load     one load experiment against a served target             -> ExperimentRun
  report   the report of a run directory                          -> ReportPaths
"""
