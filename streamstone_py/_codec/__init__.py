"""The value codec's room: what a property value, a key or a text may be in a
table, how it converts both ways, and what it weighs against Azure's limits."""
