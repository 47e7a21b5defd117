"""The built-in unlearning methods' builders, one module each.

Each module's ``build(call)`` turns a :class:`server_app.unlearning.frameworks.BuildCall`
into a :class:`server_app.unlearning.frameworks.Framework`; its description (name,
federation, history, exactness, ...) is its :func:`server_app.config.methods.register`
line, which names the builder as ``package.module:function``.
"""
