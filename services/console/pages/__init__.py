"""The console's pages, one module per part of the console; :mod:`services.console.api` joins their routers."""
