"""Teacher scoring jobs: sources, requests, pipeline, score cache, corpora, logit-cache export."""
