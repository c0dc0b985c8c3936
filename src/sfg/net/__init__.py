"""Networked nodes: the rules on separately running processes and machines (SPEC §11).

* :mod:`sfg.net.wire` — message format (msgpack header + safetensors payload) and validation;
* :mod:`sfg.net.transport` — gRPC (asyncio) server and client, chunked streaming, mutual TLS;
* :mod:`sfg.net.node` — :class:`~sfg.net.node.Node`: lockstep and asynchronous modes;
* :mod:`sfg.net.world` — what nodes derive from the run settings (data, graph, trace, model);
* :mod:`sfg.net.swarm` — many nodes over worker processes, churn, fault injection, summaries.
"""
