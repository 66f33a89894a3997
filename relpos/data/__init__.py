"""Data pipelines: enwik8 and plain-text character corpora, ordered LM batches."""
