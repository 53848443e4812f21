"""Off-policy generation jobs: prompts, requests, pipeline, output, verification."""
