"""Failed messages off the shelf: poison queues read whole and left as they were,
entries counted, shown, sent back once the cause is fixed (send, then delete: a
crash leaves a duplicate, never a loss) or purged; the streamstone-poison command."""
