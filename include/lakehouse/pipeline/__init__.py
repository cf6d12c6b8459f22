"""One micro-batch of a topic's pipeline, layer by layer (:mod:`~lakehouse.pipeline.runner`), and
what a run is asked to do beyond it (:mod:`~lakehouse.pipeline.request`).
"""
