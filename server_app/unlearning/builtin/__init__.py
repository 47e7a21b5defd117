"""The built-in unlearning methods, one module each.

Each module holds an :class:`server_app.config.methods.UnlearningMethod` subclass:
its description (name, federation, history, exactness, ...) as class attributes and
``build(request)``, which turns a :class:`server_app.unlearning.frameworks.Request`
into a :class:`server_app.unlearning.frameworks.Framework`; the registry names it
by ``package.module:Class`` (:func:`server_app.config.methods.register`).
"""
