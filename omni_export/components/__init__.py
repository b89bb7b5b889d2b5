"""Export-ready components: a fixed-signature fp32 graph, its IO spec and the host driver that runs it."""
