"""What RabbitMQ is and asks for, as plain facts: its versions, policies for an operator to
set, delivery limits, a work queue's arguments, broker URLs shown without their password.
Pure."""
