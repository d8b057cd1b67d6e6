"""Generation engines: the protocol every engine implements (concrete engines import their frameworks lazily)."""
