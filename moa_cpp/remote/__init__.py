"""Client-server MoA (paper §6; docs/client-server.md): the drafter on a client, the target on a
server (``moa-cpp serve``). Needs no web framework: the client speaks HTTP with ``http.client``.

- :mod:`.protocol` -- messages, the CA codec, validation (both sides);
- :mod:`.transport` -- the one HTTP client (protocol calls, downloads, health probe);
- :mod:`.client` -- :class:`~.client.RemoteGenerator`; :mod:`.client_parts` -- what it loads once
  (drafter, proposer, vocabulary, connection, settings); :mod:`.run` -- one generation's cycles and
  offline drafting; :mod:`.replies` -- checks of the server's answers; :mod:`.results` -- events,
  stats, result; :mod:`.files` -- which drafter / target / vocabulary a client runs;
- :mod:`.bundle` -- the client bundle's identity, reading and checks; :mod:`.bundle_write`
  (``moa-cpp bundle``), :mod:`.bundle_download`; :mod:`.gguf_info` -- what they read of a GGUF.
"""
