"""Load generation: streaming chat requests at llama-servers, one record per request.

Each module's face is its `__all__`: code outside load/ imports those names from the module that
defines them (`from quantload.load.plan import LoadPlan`), nothing else, and a module without an
`__all__` is load/'s own (a test holds both). This package imports nothing, so a Locust process
importing one module pays for no other. Nothing here imports Locust except the `in_locust` package,
which only Locust processes import (`import locust` monkey-patches the interpreter). The experiments
that use all this live in quantload.experiments.

Modules, by job.

How a plan runs
  plan            a plan's stages as data handed to the Locust processes; the stage builder
  supervisor      run_plan: starts a plan's processes, follows its records and stage lines,
                  writes each stage's summary as it ends, closes its stages
  limit_file      limits.jsonl: one line per search
  processes       which Locust processes run a plan; the worker count for this machine
  remote_worker   `quantload load-worker`: a load host's worker, joining each plan of a remote master
  calibrate       `quantload calibrate`: the client against the fake server, at rising stream counts
  calibration_file  the calibration's file: what it measured, the latest kept, what it holds a plan to
  fakeserver      the OpenAI-style streaming server of known timing (calibration, tests, benchmarks)

What a request is and how it is measured
  prompts         the 100 built-in prompts, ShareGPT and JSONL loaders
  workloads       what a stage's requests are: prompt set, lengths, dataset, trace, sessions
  workload_builder  the workloads of one target from the settings (files read, tokenizer asked)
  synthetic       prompts of an exact token length via the server's /tokenize and /detokenize
  history_trim    the client's trim of a conversation that outgrows the slot (server-counted)
  datasets        ShareGPT/JSONL conversations with line numbers
  lengths         request length distributions (prompt and output tokens per request)
  trace           timestamped request traces (arrival, prompt and answer lengths)
  limit_search    the most users (or highest rate) within the SLO, as a pure state machine
  shared_prefix   the prompt-cache experiment's system prompt (sized with /tokenize), slot reset
  tickets         tickets (one request to send), the ticket book, stage trackers
  timed_supply    a timed stage's tickets (the soak's slices): the pool again until time is up
  decided_supply  a decided stage's tickets: the planned requests, then more until its level is decided
  level_judgement a level judged as its requests finish: counts, verdict, budget
  client          the streaming HTTP/1.1 client on plain sockets (TTFT excludes connecting)
  arrival         when response bytes arrived: the kernel's receive stamps where there are any
  http1           HTTP/1.1 response framing: head, chunked, length- or close-delimited body
  sse             Server-Sent Events over that body: the `data:` payloads
  openai_chunks   what each payload means (text, end, usage, timings, errors); a stream's verdict
  stream_result   what one streamed request produced, before it becomes a record
  measure         StreamResult -> RequestRecord (TTFT, TPOT, ITL, goodput)

What comes out
  records         the record schema (quantload.record/1), stage lines, JSONL files
  summary         a stage's summary, computed in one place (StageFigures -> StageSummary)
  client_health   the load processes' CPU and loop lateness per stage; "was the client the limit"
  process_memory  a process's resident memory from /proc (the load processes', the server's)
  metrics         the load generator's Prometheus metrics (quantload_*)

  in_locust/      inside a Locust process: the user class, the shared runtime, ticket sources,
                  record sinks, the stage controller, health, messages, the interactive mode
"""
