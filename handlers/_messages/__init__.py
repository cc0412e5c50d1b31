"""A message and its two forms, canonical msgpack and the JSON envelope, and the
admission that checks, where data enters, that a message takes both and can be stored."""
