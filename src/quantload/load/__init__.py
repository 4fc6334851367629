"""Load generation: Locust users that stream chat completions, load shapes, prompts, records."""
