"""Load generation: streaming chat requests at llama-servers, one record per request.

Modules, by job (nothing here imports Locust except the three `locust_*` modules, which only
Locust processes import: `import locust` monkey-patches the interpreter):

  api             run_sweep / run_open_loop / run_prefix_cache_experiment: plan, run in Locust
                  processes, summarize (what `quantload load` and `quantload run` call)
  plan            the stages of each experiment, as data handed to the Locust process
  prompts         the 100 built-in prompts, ShareGPT and JSONL loaders
  prefix          the prompt-cache experiment's system prompt (sized with /tokenize), slot reset
  client          the streaming HTTP/1.1 client on plain sockets (TTFT excludes connecting)
  sse             HTTP response, chunked and SSE parsing; what each chunk carries
  measure         StreamResult -> RequestRecord (TTFT, TPOT, ITL, goodput)
  records         the record schema (quantload.record/1), stage events, JSONL files
  tickets         tickets, the ticket book, stage bookkeeping, client health
  summary         per-stage summaries from the raw records
  metrics         the load generator's Prometheus metrics (quantload_*)
  fakeserver      a scripted OpenAI-style streaming server for tests and benchmarks
  locust_runtime  inside a Locust process: ticket sources, sinks, the stage controller
  locust_user     the Locust user class and the interactive (`locust -f`) mode
  locust_process  the entry point of a Locust process running a plan
"""
