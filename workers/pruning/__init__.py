"""Delete-at-height pruning as a latest-height-wins job queue: requests and the job loop
(`pruner`), and one run's phases (`prunerun`)."""
