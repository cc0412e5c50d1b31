"""The files the driver looks at itself: its reach into Spark's file system, the input
files checked before Spark reads them, and a file stream's intake and checkpoint records."""
