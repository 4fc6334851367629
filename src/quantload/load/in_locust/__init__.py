"""What runs inside a Locust process; nothing else in quantload imports this package.

`import locust` monkey-patches the interpreter (gevent), so only Locust processes import these
modules: `python -m quantload.load.in_locust.process` (started by the load supervisor) and the
thin locustfiles (`locust -f locustfiles/chat_stream.py`).

  process         the entry point of a Locust process running a plan (local, master, worker)
  wiring          puts a process's parts together for its role
  user            the Locust user class: streams the tickets its process hands out
  runtime         what a process's users share: connection pools, sending, the recorder
  ticket_sources  where a user gets its next ticket: its own book, or the master's by message
  sinks           where finished requests go: appended by the driving process, forwarded by workers
  stages          the stage controller (spawn, warm up, release tickets, stage lines)
  master_watch    a worker ends when the master it joined has gone silent
  health          event-loop lateness and CPU windows; the heap freeze after spawning
  messages        the typed messages between a master and its workers
  interactive     the `locust -f` mode: endless prompts, users from the web UI
"""
