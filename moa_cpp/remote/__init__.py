"""Client-server MoA (paper §6; spec/client-server.md): the drafter on a client, the target on a
server (``moa-cpp serve``). :mod:`.protocol` (messages, CA codec, validation), :mod:`.client`
(:class:`RemoteGenerator`). Needs no web framework: the client speaks HTTP with ``http.client``."""
