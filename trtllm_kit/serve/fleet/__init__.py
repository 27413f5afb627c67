"""The fleet room: several models in one serve (members, merged repository, fit) and hot reload."""
