"""The delay chain's vocabulary: the names and arguments of its exchanges and queues
(``topology``), the routing keys that spell a delay (``routing_keys``) and the digest a
complete declaration leaves (``digest``). Pure; ``amqp/`` declares and publishes."""
