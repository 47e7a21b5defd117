"""The ClientApp: message handlers only; data, models and training are :mod:`task`'s."""
