"""`quantload tune`: the server flags that serve the most within the SLO, searched by measurement.

  space       the declared space of flags ([tune]) as configurations; what a build or a draft
              cannot run, refused before any server starts
  halving     successive halving as a pure state machine
  predicted   predict first (tune.predict_first): the space screened by predicted limit
  state_file  tune.jsonl: the search's state, appended as it goes (resume)
  search      one quantization's search against its running server
  outcome     the ranking, the winner's command line, .env and compose lines, cost, capacity plan
  tune_run    the command as local processes: prepare, serve and tune each quantization
"""
