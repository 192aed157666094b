"""Talking to RabbitMQ: declaring the topology (cached per connection), publishing with
confirms, and connections that batch their writes."""
