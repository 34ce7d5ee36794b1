"""The custom resources: their OpenAPI schemas, typed views, conditions and Event reasons."""
