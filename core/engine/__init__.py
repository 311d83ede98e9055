"""The engine-core process: EngineCore, its ZMQ loop, the wire protocol, structured outputs."""
