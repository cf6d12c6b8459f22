{#- The schemas the pipeline writes (lakehouse.storage.metastore.SCHEMAS): dbt builds none of
    its models in them. Run at the start of every dbt command (on-run-start). -#}
{% macro pipeline_schemas() %}
  {{ return(["bronze", "silver", "gold", "quarantine_bronze", "quarantine_silver",
             "late", "state", "gaps", "quality", "schemas"]) }}
{% endmacro %}

{% macro refuse_pipeline_schema() %}
  {#- The graph is there when the hook runs, not while dbt parses the project. -#}
  {%- if not execute -%}{{ return("") }}{%- endif -%}
  {%- set taken = [] -%}
  {%- for node in graph.nodes.values() if node.resource_type in ("model", "seed", "snapshot") -%}
    {%- if node.schema | lower in pipeline_schemas() -%}
      {%- do taken.append(node.unique_id ~ " -> " ~ node.schema) -%}
    {%- endif -%}
  {%- endfor -%}
  {%- if target.schema | lower in pipeline_schemas() or taken -%}
    {{ exceptions.raise_compiler_error(
        "the lakehouse's pipeline owns the schemas " ~ pipeline_schemas() | join(", ")
        ~ "; dbt writes in a schema of its own (profile schema: " ~ target.schema
        ~ (", models: " ~ taken | join(", ") if taken else "")
        ~ "). Set LAKEHOUSE_DBT_SCHEMA to another name.") }}
  {%- endif -%}
{% endmacro %}
