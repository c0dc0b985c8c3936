"""Networked nodes: the rules on separately running processes and machines (docs/concepts/nodes.md#networked-nodes).

* :mod:`sfg.net.wire` — message format (msgpack header + safetensors payload) and validation;
* :mod:`sfg.net.transport` — gRPC (asyncio) server and client, chunked streaming, mutual TLS;
* :mod:`sfg.net.node` — :class:`~sfg.net.node.Node`: what the protocols share, set-up and run;
* :mod:`sfg.net.lockstep`, :mod:`sfg.net.asyncmode`, :mod:`sfg.net.returns` — the lockstep
  rounds, the asynchronous wakes, the returns and their pull;
* :mod:`sfg.net.inbox`, :mod:`sfg.net.outgoing`, :mod:`sfg.net.localround` — a node's checks
  on arrival, its own messages and pushes, its aggregate, training and commit;
* :mod:`sfg.net.nodeconfig` — how a node runs and what it counts;
* :mod:`sfg.net.claims` — what a node claims in its headers: honest, or an attacker's forgery;
* :mod:`sfg.net.evidence` — a node's evidence about claims (+guard, +certified);
* :mod:`sfg.net.persist` — a node's checkpoint, saved outbox and resume;
* :mod:`sfg.net.cuts` — network cuts and crashes, parsed once from either syntax;
* :mod:`sfg.net.world` — what nodes derive from the run settings (data, graph, trace, model);
* :mod:`sfg.net.swarm` — many nodes over worker processes, churn, fault injection, summaries.
"""
