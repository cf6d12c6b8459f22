-- How many users are at each location now. A view: always as current as user_summary.
{{ config(materialized='view') }}

select
    current_location as location,
    count(*) as users
from {{ ref('user_summary') }}
group by current_location
