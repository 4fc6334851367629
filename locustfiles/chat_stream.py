"""Stream chat completions at --host from quantload's prompt set; TTFT and TPOT get their own rows.

    locust -f locustfiles/chat_stream.py --host http://127.0.0.1:8080 \
        --ql-server my-server --ql-quant Q4_K_M --ql-out results/interactive

Users cycle through the prompts (load.prompts, load.prompt_count) with the request settings of
quantload's configuration (quantload.toml, QUANTLOAD_LOAD__* variables). Works with --master /
--worker and --processes: workers forward their records to the master. Planned, staged runs
(the sweep, open loop, prompt-cache experiment) are `quantload load` / `quantload run`.
"""

from locust import events

from quantload.load.in_locust.interactive import install_interactive
from quantload.load.in_locust.user import StreamingChatUser


class ChatStreamUser(StreamingChatUser):
    """One simulated user streaming /v1/chat/completions."""


install_interactive(events, ChatStreamUser)
