"""The jitted engines: MATCH (`match`), SEQ (`seq` for CDP, `seq_aip` for AIP) and WINDOW
(`window`), each holding the per-key state of one query and running the kernels compiled
for it. `cep_core.engine_factory.create_engine` picks one for a checked query;
`cep_core.stream_engines.StreamEngines` runs a stream's queries together.
"""
