"""A key's batch, decided and written: the write loop, the fold over one header,
replay of stored messages, the strategies' answers to a duplicate, output id records."""
