"""What the OpenAI routes and the gateway share below both: the HTTP error and its body, the JSON body read once,
and the keys and paths a request carries between the middlewares and the handlers."""
