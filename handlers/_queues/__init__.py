"""The queue path: Azure Storage Queues in (QueueConsumer, its locks, settling and
poison queue) and out (QueuePublisher), with the breaker and rounds that wait out outages."""
