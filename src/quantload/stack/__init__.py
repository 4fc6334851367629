"""Native orchestration: the stack's services as plain processes on this machine."""
