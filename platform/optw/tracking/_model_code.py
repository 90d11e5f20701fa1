"""MLflow "models from code" entry point, copied into every registered optw model; not imported
by the package: MLflow runs it when saving and when loading a model."""

import mlflow.models

from optw.tracking.pyfunc import OptwSolverModel

mlflow.models.set_model(OptwSolverModel())
