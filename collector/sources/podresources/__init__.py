"""The kubelet's PodResources API v1 (``api.proto``, as the kubelet publishes it) and its
generated Python stubs; ``collector.sources.pod_resources`` is what calls it. Importing the stubs
needs ``grpcio`` and ``protobuf`` (the ``kubernetes`` extra)."""
