"""The queue path's Spark side: the queue source, the sink that sends outputs to queues
and settles a micro-batch's queue messages, their options and the Queue service's account."""
