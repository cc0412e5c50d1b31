"""What the demo (``make demo``) needs beside the job: the repeats it makes
Spark do, and the clean run it compares with."""
