"""The Triton Python models a repository ships, and their helpers.

Each model file is copied into the repository as its ``model.py`` (``model_repo.repository`` says which, and the
helper files copied beside it). The model files import ``triton_python_backend_utils`` and run only inside
``tritonserver``; the helpers import no ``pb_utils`` and are imported and tested from the package.
"""
