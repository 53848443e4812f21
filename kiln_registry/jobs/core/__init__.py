"""The job queue's kind-independent core: rows, repository, leases, state, retention."""
