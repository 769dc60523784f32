"""Making the shipped checkpoints: the byte-level corpus, the one training recipe every method shares,
and the evaluation written into each checkpoint's metrics.json."""
