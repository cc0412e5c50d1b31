"""What runs in Spark's tasks: each key's messages through the runtime, its outcome
and output rows, input rows to messages, Arrow batches, and a Python worker's clients."""
