"""Load generation: streaming chat requests at llama-servers, one record per request.

Modules, by job. Nothing here imports Locust except the `in_locust` package, which only Locust
processes import (`import locust` monkey-patches the interpreter).

The experiments and how they run
  experiments     run_sweep / run_open_loop / run_prefix_cache_experiment, and the traffic
                  experiments (run_sessions, run_trace, run_mixed, run_workload_sweep/_open_loop):
                  what `quantload load` and `quantload run` call (plan, run, summarize)
  limit_runner    run_limit_search: trial stages until `limit_search` has its answer
  limit_file      limits.jsonl: one line per search
  plan            the stages of each experiment, as data handed to the Locust processes
  traffic_plans   the traffic experiments' stages (sessions, trace, mixed, limit trials)
  supervisor      run_plan: starts a plan's processes, follows its progress, closes its stages
  processes       which Locust processes run a plan; the worker count for this machine
  remote_worker   `quantload load-worker`: a load host's worker, joining each plan of a remote master
  calibrate       `quantload calibrate`: the client against the fake server, at rising stream counts
  fakeserver      the OpenAI-style streaming server of known timing (calibration, tests, benchmarks)

What a request is and how it is measured
  prompts         the 100 built-in prompts, ShareGPT and JSONL loaders
  workloads       what a stage's requests are: prompt set, lengths, dataset, trace, sessions
  workload_builder  the workloads of one target from the settings (files read, tokenizer asked)
  synthetic       prompts of an exact token length via the server's /tokenize and /detokenize
  datasets        ShareGPT/JSONL conversations with line numbers
  lengths         request length distributions (prompt and output tokens per request)
  trace           timestamped request traces (arrival, prompt and answer lengths)
  limit_search    the most users (or highest rate) within the SLO, as a pure state machine
  shared_prefix   the prompt-cache experiment's system prompt (sized with /tokenize), slot reset
  tickets         tickets (one request to send), the ticket book, stage trackers
  client          the streaming HTTP/1.1 client on plain sockets (TTFT excludes connecting)
  http1           HTTP/1.1 response framing: head, chunked, length- or close-delimited body
  sse             Server-Sent Events over that body: the `data:` payloads
  openai_chunks   what each payload means (text, end, usage, timings, errors); a stream's verdict
  stream_result   what one streamed request produced, before it becomes a record
  measure         StreamResult -> RequestRecord (TTFT, TPOT, ITL, goodput)

What comes out
  records         the record schema (quantload.record/1), stage lines, JSONL files
  summary         per-stage summaries from the raw records
  client_health   the load processes' CPU and loop lateness per stage; "was the client the limit"
  metrics         the load generator's Prometheus metrics (quantload_*)

  in_locust/      inside a Locust process: the user class, the shared runtime, ticket sources,
                  record sinks, the stage controller, health, messages, the interactive mode
"""
