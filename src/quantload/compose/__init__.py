"""The compose stack seen through the Docker engine (the `docker` SDK), from the host.

- `containers`: a compose project's containers, their state and health, and what is wrong with
  them (`quantload stack ps`);
- `server_kv`: the KV-cache check of every llama-server container, from the container itself: its
  command line, its model file's GGUF header and its log since it last started
  (`quantload stack kv`).
"""
