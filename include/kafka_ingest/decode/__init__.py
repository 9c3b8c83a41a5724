"""From bytes to valid rows or dead letters: validation against the contracts (the
formats of a schema registry come here too)."""
