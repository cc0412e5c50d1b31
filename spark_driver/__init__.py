"""spark_driver: the handlers runtime as a PySpark pipeline, batch and streaming.

    >>> from spark_driver import JobSettings, run_batch, session
    >>> spark = session("local[2]")                                        # doctest: +SKIP
    >>> summary = run_batch(spark, "in/", "out/",
    ...                     JobSettings(table="games", handler="shooting_range"))  # doctest: +SKIP
    >>> print(summary.table())                                              # doctest: +SKIP

Executors build their table client from their own environment
(``STREAMSTONE_CONNECTION_STRING``, or ``STREAMSTONE_ACCOUNT_URL`` with a SAS
token or a managed identity); see :class:`JobSettings`.
"""

from ._dead_letters import DEAD_LETTER_SCHEMA, read_dead_letters, write_dead_letters
from ._input import INPUT_SCHEMA, read_messages
from ._job import process_messages, run_batch, write_result
from ._queue_stream import QueueSourceUnavailable, read_queue, register_queue_source, run_queue
from ._queues._poison import POISON_SCHEMA, read_poison
from ._queues._sink import Delivery, OutputRoute
from ._session import session
from ._settings import JobSettings, parse_duration, resolve_handler
from ._states import read_history, read_states
from ._stream import METRICS, process_stream, run_stream
from ._summary import JobResult, Summary, Unsettled

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "INPUT_SCHEMA",
    "METRICS",
    "POISON_SCHEMA",
    "Delivery",
    "JobResult",
    "JobSettings",
    "OutputRoute",
    "QueueSourceUnavailable",
    "Summary",
    "Unsettled",
    "parse_duration",
    "process_messages",
    "process_stream",
    "read_dead_letters",
    "read_history",
    "read_messages",
    "read_poison",
    "read_queue",
    "read_states",
    "register_queue_source",
    "resolve_handler",
    "run_batch",
    "run_queue",
    "run_stream",
    "session",
    "write_dead_letters",
    "write_result",
]
