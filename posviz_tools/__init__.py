"""posviz_tools: the measuring instruments, not the product.

The app is ``app.py``, ``views/`` and the core package ``posviz/`` (positions, model, data, training,
evaluation, one module per page); none of them imports anything from here, and the Docker image does
not contain this package. What lives here measures, checks or rebuilds that product from the outside:

- ``bench``: the speed table of the shipped checkpoints on this machine (``make bench``, BENCHMARKS.md),
  in parts by what they measure: ``bench_compute`` (the models), ``bench_browser`` (pages in Chromium),
  ``bench_protocol`` (the server alone), ``bench_report`` (the tables);
- ``loadtest``: a Streamlit server on loopback and crowds driving it (``make load``): sessions that speak
  Streamlit's WebSocket protocol and draw nothing (``views/_warm.ProtocolSession``), so that a crowd
  measures the server, and headless Chromium tabs (the browser tests reuse its helpers);
- ``look``: what a visitor sees on a rendered page, read from the browser (charts, error boxes,
  anything cut off);
- ``screenshots``: every page at 1920x1080 in presentation mode (``make screenshots``);
- ``report``: the results write-up's chart and tables, from the shipped metrics;
- ``train_all``: train every method with the shared recipe (``make checkpoints``).
"""
